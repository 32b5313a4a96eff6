//! `proxy-operator plugin inspect`: what a plugin declares and asks for, for review before
//! installing it.

use super::args::RuntimeArgs;
use egress_plugin_host::config::ProvidersFile;
use egress_plugin_host::plugin::Runtime;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Load a plugin and print what it declares and asks for, for review before installing:
    /// world version, type, version, the default hosts it wants (each marked usable or not:
    /// a plugin may only name public DNS hosts), the interfaces it imports, behaviour
    /// profile, size and digest.
    Inspect {
        file: PathBuf,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
}

pub async fn run(command: Command) -> anyhow::Result<()> {
    let Command::Inspect { file, runtime } = command;
    let rt = Runtime::new(runtime.options(&ProvidersFile::default()))?;
    let p = rt.load_plugin(&file).await?;
    let hosts: Vec<serde_json::Value> = p
        .default_host_review()
        .into_iter()
        .map(|(host, problem)| {
            serde_json::json!({
                "host": host,
                "usable": problem.is_none(),
                "problem": problem,
            })
        })
        .collect();
    let out = serde_json::json!({
        "file": p.path,
        "sha256": p.sha256,
        "sizeBytes": p.size,
        "world": format!("egress:provider@{}", p.version()),
        "type": p.info.type_name,
        "version": p.info.version,
        "hasCheck": p.info.has_check,
        // What a provider entry without `budget` gets (0.2.0), after the host's cap.
        "defaultBudget": p.info.default_budget.map(|b| {
            let capped = egress_plugin_host::rate::cap_default(b);
            serde_json::json!({
                "requestsPerHour": capped.per_hour,
                "burst": capped.burst,
                "declared": {"requestsPerHour": b.per_hour, "burst": b.burst},
            })
        }),
        "defaultHosts": hosts,
        "imports": p.imports(),
        "profile": p.info.profile.iter().cloned().collect::<BTreeMap<_, _>>(),
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
